"""The fleet: a sweep spread over several boxes with Ray, one shard (the base and some variants, all rounds) per box,
since speeds and paired figures are valid only between starts on one box. Ray is imported only here, and only by
the driver and the shard task (never by an engine's process: in_engine/no_ray.py)."""
