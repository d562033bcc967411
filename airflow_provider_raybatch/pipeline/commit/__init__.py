"""The output's commit protocol: the plan, the commit records, the writer leases, the output's
schema, and the verifier that checks an output against them."""
