"""The site record and the state table: what a run knows of each site, node and attempt, and how it is stored.

`state` is the record (`SiteRecord`, the statuses), `ops` the conditional updates a hub or a node makes to it,
`failures` the failure classes that end an attempt, `ids` and `tags` the names of sites, runs, instances and
their tags, `instance` an instance as a provider reports it; `table` and `messages` the interfaces of the state
table and the site queue; `codec`, `partition`, `readback`, `run_item` and `stamp` how items are written and read
back (every value a node may have written read as hostile).
"""
