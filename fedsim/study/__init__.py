"""A study: every run of an experiment (variants x seeds) as one unit.

`fedsim run CONFIG` plans the study (`plan`: one run directory per run,
recorded in `<logdir>/<name>/study.yaml`), then an executor (`executors`)
plays the runs that are not complete (`runner`). The plan is what
`fedsim run --resume <logdir>/<name>` continues and `fedsim status` lists.
"""
