"""Getting a function's bytes to the device: stores, caches, formats, instances."""
