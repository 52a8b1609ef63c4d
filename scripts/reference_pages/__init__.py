"""The generated pages of docs/reference, one module per page or two: each renders its page from the code it
documents (`scripts/docs_reference.py` writes and checks them)."""
