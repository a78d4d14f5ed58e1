"""Weight formats, one module each, opened by mapping files rather than reading them."""
