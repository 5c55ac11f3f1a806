"""The task factory: SWE-bench-style training tasks synthesized from a Python repository by injecting bugs its
tests catch (`orchard tasks synthesize`). mutations.py proposes the bugs, source.py holds the repository and the
tasks' commits, statements.py writes what the agent is told, synthesize.py runs it all through the env service."""
