"""What a run keeps on disk and reads back: checkpoints with their manifests, the
client-state store, the final model's weights, crash-safe file writes, and the rewind
of a run directory's logs to a checkpoint before a resumed run continues."""
