"""The host artifact cache: a content-addressed store and the resolvers that fill it.

The guest has no network. Everything it installs (Debian packages, Node and Bun, Harbor's
wheels, the harnesses' npm trees) is resolved on the host for the guest's architecture, fetched
into the store and recorded with its digest in the lock's resolution file.
"""
