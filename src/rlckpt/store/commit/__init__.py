"""The commit protocol: a transaction (`transaction`: write, commit, abort), the participants that join one
and seal their files (`participant`), the claim of a step by one live writer (`claims`) and the one check
that decides whether a step is a committed bundle, run by writers and readers alike (`commit_check`)."""
