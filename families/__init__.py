"""Environment families: the contract every environment keeps and the
families that keep it.

`contract.py` says what an environment class returns (the step output and
its tensor specs) and what a family tells the registry (`EnvironmentFamily`:
its level names, suites, actions, flags, options and scores). Each family is
one module: Atari through ale-py (`atari.py`, with the Atari-57 suite in
`atari57.py`), DeepMind Lab (`dmlab.py`, with DMLab-30 in the root's
`dmlab30.py`) and ViZDoom (`doom.py`); `vector.py` runs several environments
of one level in one process. The registry that asks them is the root's
`environments.py`. Nothing here imports TensorFlow at module level: these
modules are what environment processes import.
"""
