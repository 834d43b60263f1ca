"""lustrain's CLI and local twin (not deployed to Lambda)."""
