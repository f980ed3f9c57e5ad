"""The fixes, one module per fix, each declaring one ``Fix`` named after its file. The
list of them, in the order advice is given, is ``MODULES`` in ``stepscope.fixes``; the
machinery they plug into (``base``, ``install``, ``points``, ``took_effect`` ...) sits
one folder up.
"""
