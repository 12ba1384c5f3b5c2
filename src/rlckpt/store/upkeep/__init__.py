"""What happens to bundles after their commit: garbage collection as a plan, then its application (`gc`),
the retention rules (`retention`) and the copy of a bundle into another store as the same bundle
(`replica`)."""
