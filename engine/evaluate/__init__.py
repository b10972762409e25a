"""Evaluating contexts against a policy: the decision index, its compiled fast path, the reference
interpreter, resolutions, the input domain, and what holds for every model an unknown architecture may be."""
