"""fedsim's control over the TFF runtime process and TensorFlow's start-up.

Kept free of TensorFlow imports: `fedsim.runtime.quiet` and
`fedsim.runtime.worker` import it when they are imported themselves.
"""
