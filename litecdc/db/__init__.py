"""SQLite through APSW: the only package that touches SQLite."""
