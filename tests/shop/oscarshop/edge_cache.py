"""A site-wide cache lifetime, as an operator who wants the catalogue
cached at the edge might set one: pages that name no Cache-Control get
`max-age=PAGE_MAX_AGE`, signed-in pages included. The gateway must then
still keep them to their user (it shares nothing asked for with a cookie
unless marked `public`)."""

from django.conf import settings
from django.utils.cache import patch_cache_control


class PageMaxAgeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.max_age = settings.PAGE_MAX_AGE

    def __call__(self, request):
        response = self.get_response(request)
        if self.max_age and not response.has_header("Cache-Control"):
            patch_cache_control(response, max_age=int(self.max_age))
        return response
