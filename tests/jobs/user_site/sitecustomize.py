"""A user's own sitecustomize: stepscope's must chain to it."""

import os

os.environ["USER_SITECUSTOMIZE_RAN"] = "yes"
