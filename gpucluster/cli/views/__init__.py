"""The output layer: one module per command's view, for people (rich) and machines (JSON
with a schema number). Core returns values; only these modules turn them into text."""
