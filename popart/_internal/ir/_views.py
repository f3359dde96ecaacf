"""Views: each popxl object (Ir, Graph, Op, Tensor, Session) has one PopART-style view, made on
first use and kept on the object, so wrapping twice gives the same view and unwrapping always
gives back the same popxl object. The base class and the two functions live in popxl's core
(``popxl._pb``), which reaches the views through them; the classes of the views are this
package's, registered with the core by ``popart._internal.ir._factory``."""
from popxl._pb import View, popxl_object, view_of

__all__ = ["View", "view_of", "popxl_object"]
