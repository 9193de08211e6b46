"""The experiment config: YAML files, `--set` overrides, variants, and their
typed form (`schema.ExperimentConfig`). It sits above every registry it names;
the typed-parsing machinery the registries use is the base `fedsim.config.typed`."""
