"""Driving vLLM from outside its processes: the environment and command of a start (environment, command),
the server child and its teardown (server), reading its output (logs), the HTTP client (client), the fresh
starts of a contract (starts) and the collective probe before them (probe).

This file imports nothing: each surface imports the module it needs.
"""
