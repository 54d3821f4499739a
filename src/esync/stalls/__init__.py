"""The internals of `esync-stalls`: the probe of a real loop and its cost model."""
