"""polite_demo: a Scrapy project that crawls Python's pydoc documentation politely with scrapy-polite."""
