"""What a run leaves behind: results, checkpoints, the run's archive, its summary and the message that it ended.

`results` the result store and its keys (staged by nodes, made a site's by the hub), `checkpoint` the parts a
crawl resumes from, `archive` the run's records in the bucket, `summary` summary.json and the export,
`notify` the end-of-run message.
"""
