"""A news team's site crawlers: one `BaseCrawler` subclass per kind of site."""
