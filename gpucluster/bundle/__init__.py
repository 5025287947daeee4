"""gpucluster bundle: a whole cluster's (and a job's) diagnostics in one archive."""

# The archive's default name (in the current directory, often the work dir), and what
# a work dir's sync therefore never sends.
ARCHIVE_PREFIX = "gpucluster-bundle-"
ARCHIVE_PATTERNS = (f"{ARCHIVE_PREFIX}*.tar.gz", f"{ARCHIVE_PREFIX}*.tar.gz.partial")
