"""What a loader reports about itself: the mixing of its epochs and the summary of its plan.

Read by the faces (``repr``, ``stats()``, the first-epoch checks); nothing below imports it.
"""
