"""Process groups and the sandbox for generated code: the standard library only, since the sandbox's child
side runs without the package."""
