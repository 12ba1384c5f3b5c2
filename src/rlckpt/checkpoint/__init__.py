"""The save and restore procedures of a whole run bundle: ARCHITECTURE's orderings, in one place."""
