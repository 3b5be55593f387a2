"""Test mode (`--mode=test`): the last checkpoint played for
`--test_num_episodes` episodes per level, its returns and human-normalised
scores printed as a table and written to the run directory
(`test_mode.py`), and the first episode of each level optionally recorded as
an animated GIF (`video.py`).
"""
