"""Sphinx configuration of popxl-cpu's documentation: the user guide (``guide/*.md``, Markdown read
by MyST) and the API reference (``api/*.rst``, built from the docstrings (Google style) by autodoc
and napoleon): ``sphinx-build -W -b html docs build/docs`` (CI builds it with warnings as errors).
The code blocks of the guide are run by ``tests/docs/test_code_blocks.py``."""
import popxl

project = "popxl-cpu"
release = version = popxl.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_default_options = {"members": True, "member-order": "bysource"}
# Signatures show annotations as written (``Optional[Tensor]``), not expanded aliases.
autodoc_typehints = "signature"
autodoc_type_aliases = {"TensorLike": "popxl.tensor.TensorLike", "HostScalarTensor": "popxl.tensor.HostScalarTensor"}
html_theme = "alabaster"
html_title = f"popxl-cpu {release}"
# architecture.md is the contributors' design notes, read in the repository (not part of the site)
exclude_patterns = ["_build", "architecture.md"]
