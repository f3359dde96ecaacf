"""PopART's internal Python modules, as far as PopXL programs and popxl-addons reach into them.

``popart._internal.ir`` is a compatibility view of popxl's own IR (there is one IR): see its
docstring.
"""
