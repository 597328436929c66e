"""Settings of the test's Oscar shop: a stock django-oscar 4.2 with the
settings an operator changes to put it behind Flashgate (docs/SHOP.md).

Environment (tests/shop/oscar.sh sets them):
- OSCAR_DATA_DIR: the SQLite database, collected static files, media.
- DJANGO_SECRET_KEY: signs sessions and CSRF tokens.
- OSCAR_CSRF_TRUSTED_ORIGINS: space-separated origins the gateway serves
  the shop on (scheme://host[:port]), for forms posted over HTTPS.
- OSCAR_PAGE_MAX_AGE: when set, every page without a Cache-Control of its
  own gets `max-age=N`, as a site-wide cache header would give it: the
  gateway must still never share a signed-in page.
"""

import os
from pathlib import Path

from oscar.defaults import *  # noqa: F401,F403 (Oscar's own defaults)
from oscar import INSTALLED_APPS as OSCAR_APPS

DATA_DIR = Path(os.environ["OSCAR_DATA_DIR"])
SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

# Behind the gateway: the scheme the client used comes in
# X-Forwarded-Proto, the host it asked for in X-Forwarded-Host.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = True
CSRF_TRUSTED_ORIGINS = os.environ.get("OSCAR_CSRF_TRUSTED_ORIGINS", "").split()

INSTALLED_APPS = OSCAR_APPS + ["sorl.thumbnail"]
SITE_ID = 1

MIDDLEWARE = [
    "oscarshop.edge_cache.PageMaxAgeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.contrib.flatpages.middleware.FlatpageFallbackMiddleware",
    "oscar.apps.basket.middleware.BasketMiddleware",
]
PAGE_MAX_AGE = os.environ.get("OSCAR_PAGE_MAX_AGE")

ROOT_URLCONF = "oscarshop.urls"
WSGI_APPLICATION = "oscarshop.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [Path(__file__).parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.debug",
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.template.context_processors.i18n",
                "django.contrib.messages.context_processors.messages",
                "oscar.apps.search.context_processors.search_form",
                "oscar.apps.checkout.context_processors.checkout",
                "oscar.apps.communication.notifications.context_processors.notifications",
                "oscar.core.context_processors.metadata",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "db.sqlite3",
        "ATOMIC_REQUESTS": True,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

AUTHENTICATION_BACKENDS = (
    "oscar.apps.customer.auth_backends.EmailBackend",
    "django.contrib.auth.backends.ModelBackend",
)

HAYSTACK_CONNECTIONS = {
    "default": {"ENGINE": "haystack.backends.simple_backend.SimpleEngine"},
}

LANGUAGE_CODE = "en-gb"
USE_I18N = True
USE_TZ = True
TIME_ZONE = "UTC"

# Oscar's own assets, served by the shop itself (WhiteNoise) under /static/.
STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
# An hour in every cache, the gateway's included (WhiteNoise's default
# is a minute).
WHITENOISE_MAX_AGE = 3600
MEDIA_URL = "/media/"
MEDIA_ROOT = DATA_DIR / "media"

EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
OSCAR_SHOP_NAME = "Flashgate test shop"
OSCAR_DEFAULT_CURRENCY = "EUR"
OSCAR_SEND_REGISTRATION_EMAIL = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}
