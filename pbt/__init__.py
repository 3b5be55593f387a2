"""Population Based Training as the paper ran it (appendix F, Table D.1).

rule.py is the rule (pure Python: priors, readiness, copy, perturbation),
records.py the population's shared directory (member records and the
lineage, written atomically through tf.io.gfile), fitness.py a member's
fitness from its episodes.
"""
