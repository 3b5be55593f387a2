"""What every benchmark shares: `common` (the machine and its load, the
raw-emulator ceiling, experiment.py run in a child and measured from
inside, a commit's code snapshot beside the working tree's, JSON records)
and `figures` (matplotlib without a display, the study records' curves
alone or overlaid). Nothing here is run by itself but `common.py`'s
ceiling: `python3 benchmarks/core/common.py 10` (seconds)."""
