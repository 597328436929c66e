"""Puts what the test needs into a migrated shop: one customer and one
product in stock. Run as `python -m oscarshop.seed EMAIL PASSWORD`."""

import sys
import warnings

import django

# Haystack's simple backend keeps no index, and says so on every save.
warnings.filterwarnings("ignore", message="update is not implemented")
# Treebeard 7 names its replacement but does not take fields there yet.
warnings.filterwarnings("ignore", message="Using Category.add_root")

django.setup()

from decimal import Decimal  # noqa: E402

from django.contrib.auth import get_user_model  # noqa: E402
from oscar.core.loading import get_model  # noqa: E402

ProductClass = get_model("catalogue", "ProductClass")
Product = get_model("catalogue", "Product")
Category = get_model("catalogue", "Category")
ProductCategory = get_model("catalogue", "ProductCategory")
Partner = get_model("partner", "Partner")
StockRecord = get_model("partner", "StockRecord")


def main(email, password):
    user = get_user_model().objects.create_user(
        username=email.split("@")[0], email=email, password=password
    )
    user.first_name = "Drop"
    user.save()
    kind = ProductClass.objects.create(name="Shoes", requires_shipping=True, track_stock=True)
    shoes = Category.add_root(name="Shoes")
    product = Product.objects.create(
        title="Flash sneaker",
        upc="FLASH-1",
        product_class=kind,
        structure=Product.STANDALONE,
        description="The sneaker of the drop.",
    )
    ProductCategory.objects.create(product=product, category=shoes)
    partner = Partner.objects.create(name="Flashgate warehouse")
    StockRecord.objects.create(
        product=product,
        partner=partner,
        partner_sku="FLASH-1",
        price_currency="EUR",
        price=Decimal("120.00"),
        num_in_stock=100,
    )
    print(f"product {product.get_absolute_url()}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
