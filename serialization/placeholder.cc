namespace strata {}
