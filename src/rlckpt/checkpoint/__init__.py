"""The save and restore procedures of a whole run bundle: the orderings of docs/architecture.md, in one place."""
