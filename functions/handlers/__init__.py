"""One Lambda handler per state of the state machine. Each is thin: parse the event, call the core, return a dict.

The run's state document (what the state machine passes along, each handler's result under its own key):

    execution input   an S3 "Object Created" EventBridge event (the spec dropped into the jobs bucket),
                      or {"spec": {...}} / {"spec_s3_uri": "s3://..."} started from the console or the CLI;
                      the ASL adds {"execution": "$$.Execution.Name"}.
    $.job             register_job      {job_id, duplicate, spec (normalised), plan, source, started_at}
    $.quota           check_quota       {quota_code, limit, in_use, requested, available}
    $.network         create_network    {vpc_id, subnet_id, security_group_ids, route_table_id,
                                         endpoint_id, availability_zone, created}
    $.filesystem      create_filesystem then check_filesystem (poll loop)
                                        {file_system_id, lifecycle, dns_name, mount_name,
                                         directory_path, created, polls, wait_seconds}
    $.code            upload_code       {submit_directory, bucket, key, sha256, uploaded, metric_definitions}
    $.training        start_training (waitForTaskToken; payload adds task_token) returns at once;
                      on_training_event sends the task's output:
                                        {training_job_name, status, archive_s3_uri, manifest_s3_uri,
                                         model_artifacts, metrics, billable_seconds}
    $.error           set by every Catch: {Error, Cause}
    $.teardown        teardown          {deleted: [...], kept: [...]}
    $.notify          notify            {message_id, outcome}

Handlers receive the whole document (start_training: the document plus task_token) and return only their key's
value. Errors are raised as lustrain_core.errors classes: their names are what the ASL catches.
"""
