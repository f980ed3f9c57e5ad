"""The two programs over stepscope's packages: the `stepscope` command (``cli/``) and the
Streamlit dashboard (``dashboard/``).

What both say the same way lives here, beside them: ``formats`` (numbers, shares,
ratios as people read them) and ``applied`` (what an experiment's trial applied). Logic
that is neither terminal nor page belongs in the layers below, where both can call it.
"""
