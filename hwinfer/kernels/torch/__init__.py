"""Vectorised torch implementations (any device); each names the op contract it implements."""
