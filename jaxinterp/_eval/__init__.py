"""Forward evaluation: the identity transformation built on the walker."""
