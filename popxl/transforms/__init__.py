"""IR-to-IR transforms (autodiff and friends arrive with the autodiff issue)."""
__all__: list = []
