"""lustrain's core: the job spec, the planner, the errors and the AWS steps of a run.

Nothing here needs AWS to import; the AWS steps take their boto3 clients from `clients`.
"""
