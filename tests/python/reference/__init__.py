"""Independent Python oracles for the C++ code (they share no code with it)."""
