"""Layer 0, the shared core: identity and its binding, records and options, the error tree.

Everything else imports from here; nothing here imports from the rest of the package.
"""
