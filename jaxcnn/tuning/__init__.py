"""The decision owner: what jaxcnn has measured and decided on this machine (tuning caches), and how it keeps them on disk."""
