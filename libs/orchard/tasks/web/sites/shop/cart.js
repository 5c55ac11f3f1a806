// The Teacup shop's cart. It lives in this browser context's localStorage as [{id, name, price, qty}], so
// concurrent agents (each in its own context) never share a cart and the server stays stateless.
var Cart = {
  load: function () {
    try { return JSON.parse(localStorage.getItem('cart')) || []; } catch (e) { return []; }
  },
  save: function (items) {
    localStorage.setItem('cart', JSON.stringify(items));
    Cart.showCount();
  },
  money: function (cents) { return '$' + (cents / 100).toFixed(2); },
  count: function () { return Cart.load().reduce(function (n, it) { return n + it.qty; }, 0); },
  showCount: function () {
    var link = document.getElementById('cart-link');
    if (link) link.textContent = 'Cart (' + Cart.count() + ')';
  },
  add: function (id, name, price) {
    var items = Cart.load();
    var item = items.find(function (it) { return it.id === id; });
    if (item) item.qty += 1; else items.push({id: id, name: name, price: price, qty: 1});
    Cart.save(items);
  },
  change: function (id, delta) {
    var items = Cart.load();
    items.forEach(function (it) { if (it.id === id) it.qty += delta; });
    Cart.save(items.filter(function (it) { return it.qty > 0; }));
  },
  bindAddButtons: function () {
    document.querySelectorAll('button[data-id]').forEach(function (b) {
      b.addEventListener('click', function () {
        Cart.add(b.dataset.id, b.dataset.name, parseInt(b.dataset.price, 10));
        document.getElementById('added').textContent = 'Added ' + b.dataset.name + ' to the cart.';
      });
    });
    Cart.showCount();
  },
  // The cart page: one row per item with quantity buttons, the total, and a checkout link.
  renderCart: function () {
    var items = Cart.load(), box = document.getElementById('cart'), total = 0;
    if (!items.length) {
      box.innerHTML = '<p>Your cart is empty.</p>';
      document.getElementById('to-checkout').hidden = true;
      return;
    }
    var html = '<table><tr><th>Product</th><th>Quantity</th><th>Subtotal</th></tr>';
    items.forEach(function (it) {
      total += it.price * it.qty;
      html += '<tr><td>' + it.name + '</td><td>' +
        '<button type="button" id="dec-' + it.id + '" aria-label="Decrease quantity of ' + it.name + '">-</button> ' +
        '<span id="qty-' + it.id + '">' + it.qty + '</span> ' +
        '<button type="button" id="inc-' + it.id + '" aria-label="Increase quantity of ' + it.name + '">+</button>' +
        '</td><td>' + Cart.money(it.price * it.qty) + '</td></tr>';
    });
    box.innerHTML = html + '</table><p id="cart-total">Total: ' + Cart.money(total) + '</p>';
    items.forEach(function (it) {
      document.getElementById('dec-' + it.id).onclick = function () { Cart.change(it.id, -1); Cart.renderCart(); };
      document.getElementById('inc-' + it.id).onclick = function () { Cart.change(it.id, 1); Cart.renderCart(); };
    });
    document.getElementById('to-checkout').hidden = false;
  },
  // The checkout page: a summary of the cart, posted with the form as "id:qty,id:qty".
  renderCheckout: function () {
    var items = Cart.load(), total = 0;
    document.getElementById('summary').innerHTML = items.length ? items.map(function (it) {
      total += it.price * it.qty;
      return '<li>' + it.qty + ' x ' + it.name + '</li>';
    }).join('') + '<li>Total: ' + Cart.money(total) + '</li>' : '<li>Your cart is empty.</li>';
    document.getElementById('items').value = items.map(function (it) { return it.id + ':' + it.qty; }).join(',');
  }
};
