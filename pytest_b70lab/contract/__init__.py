"""The experimental identity: the contract and its variants, the embedded default, where the lab's files are.
Data: imports nothing of the harness but the ground."""
