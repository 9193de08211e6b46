"""Running experiments: turning a config into a simulation and running its rounds."""
