"""Sphinx configuration of popxl-cpu's API reference, built from the docstrings (Google style) by
autodoc and napoleon: ``sphinx-build -W -b html docs/api build/docs/api`` (CI builds it with
warnings as errors)."""
import popxl

project = "popxl-cpu"
release = version = popxl.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_default_options = {"members": True, "member-order": "bysource"}
# Signatures show annotations as written (``Optional[Tensor]``), not expanded aliases.
autodoc_typehints = "signature"
autodoc_type_aliases = {"TensorLike": "popxl.tensor.TensorLike", "HostScalarTensor": "popxl.tensor.HostScalarTensor"}
html_theme = "alabaster"
html_title = f"popxl-cpu {release} API reference"
exclude_patterns = ["_build"]
