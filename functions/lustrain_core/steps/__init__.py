"""The AWS steps of a run, one module per area; each handler calls one function here.

Steps take boto3 clients (and the state document's pieces) as arguments and never build clients themselves, so a
test hands them moto's or an in-memory fake. The state document they read and return is modelled in
lustrain_core.document, the decisions they act on in lustrain_core.launch_plan (compiled once by register_job), and
the requests they send are built by lustrain_core.aws_requests.
"""
