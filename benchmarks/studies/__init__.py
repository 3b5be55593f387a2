"""Studies: several training runs (arms) compared at equal frames, each
trained to its budget and tested by the study runner (runner.py, with
records.py; the command line is `python3 benchmarks/study.py STUDY
--results DIR --logdir_root DIR`), a module a study with its arms, table
and figure: atari_study (Atari-5, its validation suites, the tuning of
Atari's default; the overlay of two folders of records), off_policy_study
(the paper's Table 2), pbt_study (a population against its fixed twin) and
popart_study (PopArt against plain IMPALA on a multi-task flag file; its
own command line, `python3 benchmarks/studies/popart_study.py --help`)."""
