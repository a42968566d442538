"""Repository tools that are not part of the installed package (training the demo model, fetching wheels)."""
