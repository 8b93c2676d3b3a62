"""Recipe: a policy loss registered from outside ``skyrl/`` (see ``loss.py``)."""
