"""Crawl policy: what a crawler is and how it is held to its contract and to the sites' limits.

`crawlers` the built-in crawlers and the base class, `project` and `crawlerfile` a team's own crawler project,
`contract` and `css` the checks of a site's data, `pacing` the fleet's shared request pacing, `blocked` how a
page that refuses the crawler is told from one that failed.
"""
