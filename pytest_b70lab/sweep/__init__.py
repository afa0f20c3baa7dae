"""`b70lab sweep`: the lab's optimisation loop as one command (plan.py: the folder and the order of starts;
runner.py: the starts and the replays that judge them; table.py: one row per variant from its run folder).
Imports nothing: the command line loads what it uses."""
