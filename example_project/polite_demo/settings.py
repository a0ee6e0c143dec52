# Scrapy settings for the polite_demo project.
#
# The only scrapy-polite wiring is the ADDONS line, exactly as the package README says. Everything else is
# an ordinary Scrapy setting or a POLITE_* setting left at its default unless noted.
#
#     https://docs.scrapy.org/en/latest/topics/settings.html

BOT_NAME = "polite_demo"

SPIDER_MODULES = ["polite_demo.spiders"]
NEWSPIDER_MODULE = "polite_demo.spiders"

# Identify yourself: robots.txt groups are matched against this product token.
USER_AGENT = "polite-demo/1.0 (scrapy-polite example project)"

# Obey robots.txt rules: scrapy-polite adopts each host's Crawl-delay / Request-rate from it.
ROBOTSTXT_OBEY = True

# scrapy-polite: per-host pacing, Retry-After, backoff, deferral, and the persisted pace table
# (.scrapy/polite.sqlite3 of this project, since POLITE_STORE is not set).
ADDONS = {"scrapy_polite.Addon": 0}

# The demo's hosts live on loopback addresses. scrapy-polite's resolver refuses non-public addresses
# unless they are allowed here (for intranets and demos like this one).
POLITE_ALLOWED_NETWORKS = ["127.0.0.0/8"]

# Pacing is scrapy-polite's job: leave Scrapy's own delay and AutoThrottle off.
DOWNLOAD_DELAY = 0
AUTOTHROTTLE_ENABLED = False

# RETRY_TIMES is left alone (README): scrapy-polite retries a throttled page (429) itself, once the host's
# Retry-After has passed, up to POLITE_THROTTLE_RETRIES (10) times, without using Scrapy's RETRY_TIMES.

TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"

# Set settings whose default value is deprecated to a future-proof value
FEED_EXPORT_ENCODING = "utf-8"
